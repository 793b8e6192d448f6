"""The kopf adapter: registration (startup, cleanup, login) and the admission handler."""
