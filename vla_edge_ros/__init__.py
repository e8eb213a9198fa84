# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla_edge_ros: a vision-language-action reasoning loop under a hard control deadline."""

__version__ = "0.1.0"
