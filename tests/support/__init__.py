"""Helpers shared by every test tier; pytest.ini puts tests/ on sys.path."""
