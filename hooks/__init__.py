"""attncoda.hooks: everything that touches models (capture, zoo, offline assets, gates, plug-ins)."""
