"""What work costs: memory projections of the stages' actors and the GPU-hour estimate of a build."""
