"""The moving parts: the reconciler that keeps the inventory in step with the cloud, the bounded
task queue, the workers that create and delete servers, and the controller the service calls."""
