"""Exact theory on enumerable token MDPs: J, grad J and the exact moments of every estimator."""
