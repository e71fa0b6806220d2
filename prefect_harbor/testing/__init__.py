"""Test doubles that ship with the package: the scripted OpenAI-compatible model server the tests and demos use."""
