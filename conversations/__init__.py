"""An AI assistant for Django sites: a chat widget, a DRF API and RQ jobs that never end silently."""
