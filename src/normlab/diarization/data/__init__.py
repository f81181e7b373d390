"""Training data: base voices, perturbations, simulated conversations, features and frame labels."""
