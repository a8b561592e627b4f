"""Small helpers every component may import (no imports from the components themselves)."""
