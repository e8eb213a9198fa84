# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
