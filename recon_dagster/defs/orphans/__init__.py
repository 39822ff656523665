"""The orphan sweep: upstream tasks no in-flight job owns, adopted, cancelled or reported."""
