"""The Pulumi program: from a stack's Plan to Kubernetes resources."""
