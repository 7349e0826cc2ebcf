"""What every layer may use: lazy module imports and the logging adaptor. Imports no other
part of sepp."""
