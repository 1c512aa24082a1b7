"""torch.compile integration: what dynamo and AOTAutograd ask of a traceable wrapper subclass
(tangents, functions recorded whole) and the registration with dynamo when it loads."""
