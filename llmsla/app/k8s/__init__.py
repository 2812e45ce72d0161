"""Kubernetes: the generated parts of ``deploy/k8s`` and their offline validation
(``llmsla deploy render|validate``, docs/deploy.md)."""
