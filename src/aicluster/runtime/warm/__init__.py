"""Warm starts: a node's warm process (zygote) per tenant, the actor that holds it, the launch
channel, the warm-ups the control loop asks for."""
