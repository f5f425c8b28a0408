"""What the API, the dashboard and ``/metrics`` show of the control plane, read from its state:
the queue, node power, goodput, the cost of preemption, the twin export and the metrics."""
