"""The request path: validate, pick a unit, call its leader, relay the answer."""
