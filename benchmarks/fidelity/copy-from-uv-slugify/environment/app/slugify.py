"""Titles to URL slugs."""


def slugify(title: str) -> str:
    slug = title.lower().replace(" ", "-")
    return "".join(c for c in slug if c.isalnum() or c == "-")
