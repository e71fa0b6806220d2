"""An Osmosis v0.3 project: an agent that answers arithmetic questions, and its grader."""
