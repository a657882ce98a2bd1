"""Checkers: each looks at one region and proposes the operator that repairs it."""
