"""Continuous learning on the control plane: registering a job's exported model, and the
pipelines that retrain a deployment's model and roll it out."""
