"""Runnable case studies composed from attncoda and attncoda.hooks (nothing imports them)."""
