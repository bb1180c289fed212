"""Live panels on the right: caches, acceptance per level, memory."""
from app.panels.acceptance_panel import AcceptancePanel
from app.panels.cache_panel import CachePanel
from app.panels.memory_panel import MemoryPanel

__all__ = ["AcceptancePanel", "CachePanel", "MemoryPanel"]
