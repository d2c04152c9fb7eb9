"""Package data: vocabularies and label spaces shipped with cnsbench (read, never imported)."""
