"""pytest glue for the preflight concern (fixtures, options in the ml4 group); the core lives outside this file."""
