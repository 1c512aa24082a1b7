"""The test suite, one package per feature of ``src/sparsefill`` (tests/ops/pointwise, tests/masked, ...).

Every folder is a package, so a test module imports another's helpers by its full name
(``from tests.opinfo.test_opinfo import ...``) and two folders may hold modules of the same name.
"""
