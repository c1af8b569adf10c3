"""sglfleet: an SGLang fleet on a Proxmox GPU host, and the batch-generation jobs it runs."""

__version__ = "0.1.0"
