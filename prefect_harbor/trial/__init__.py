"""One row's Harbor trial: its configuration, the task's environment variables, the reward, prewarm."""
