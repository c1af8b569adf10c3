"""Helpers shared by every test tier (pytest.ini puts tests/ on sys.path: `from support.polling import wait_until`)."""
