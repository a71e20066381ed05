"""Model frontends: turn a framework's model file into the npuc IR."""
