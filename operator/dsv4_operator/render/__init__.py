"""Pure builders of the child objects of a DSV4Deployment."""
