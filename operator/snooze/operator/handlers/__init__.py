"""The operator's kopf handlers: its lifecycle, one module per resource it watches, and the registry
that wires them."""
