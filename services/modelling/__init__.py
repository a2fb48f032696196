"""Model helpers: the locally built tiny test model (``services.modelling.tiny``)."""
