"""Test doubles users can run too: the SGLang stand-in server and the lab's PVE bridge."""
