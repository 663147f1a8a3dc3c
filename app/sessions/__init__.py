"""Sessions: keys, generations, history, leases and the model window."""
