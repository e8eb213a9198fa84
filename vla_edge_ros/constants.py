"""Shapes fixed by the design (DESIGN.md §1): one frame is 32 vision tokens, one chunk decodes 8 actions."""

FRAME_H, FRAME_W, FRAME_C = 64, 128, 3
PATCH = 16
GRID_H, GRID_W = FRAME_H // PATCH, FRAME_W // PATCH  # 4 x 8
VISION_TOKENS = GRID_H * GRID_W  # 32
PATCH_DIM = PATCH * PATCH * FRAME_C  # 768, flattened (row, col, channel) inside a patch
ACTION_TOKENS = 8  # decode passes per chunk, one transient KV slot each
ACTION_VOCAB = 256  # the last 256 ids of the vocabulary (OpenVLA convention)
