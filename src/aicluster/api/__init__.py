"""The REST API (FastAPI): authentication, schemas, routes."""

from aicluster.api.app import create_app
from aicluster.control.settings import InsecureBinding, ServerSettings, is_loopback

__all__ = ["InsecureBinding", "ServerSettings", "create_app", "is_loopback"]
