"""Running the tuning loop: trials, executors, history and resume, sensitivity ranking."""
