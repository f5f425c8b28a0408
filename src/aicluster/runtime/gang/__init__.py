"""Gang execution: launching a job's ranks as Ray actors, their handle and status, the rank worker,
GPU devices, input data cache, the step-timing shim."""
