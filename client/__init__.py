"""The snet worker: receives weights, computes bunch updates on its data, sends them."""
