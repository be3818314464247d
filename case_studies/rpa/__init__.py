"""RPA + Guardian case study on Austen (see README.md)."""
