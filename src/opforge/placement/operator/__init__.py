"""Operators: the steps that change a region, and the controller that runs them."""
