"""pytest glue for the restart concern (fixtures, options in the ml4 group); the core lives outside this file."""
