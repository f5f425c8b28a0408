"""The control loop and the parts its tick drives: taking jobs in, the gangs' lifecycle through
the runtime port, nodes, power saving, forecasts, and the guards that keep a tick going."""
