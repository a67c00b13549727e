"""The code sandbox: warm bubblewrap workers that fork an isolated child per execution."""
