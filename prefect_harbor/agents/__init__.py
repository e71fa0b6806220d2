"""What runs inside a trial: Harbor's native agents bound to an endpoint, and Osmosis workflows (bundle, harness, Python environments)."""
