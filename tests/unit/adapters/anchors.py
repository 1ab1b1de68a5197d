"""torchvision's ImageFolder listing rule, pinned here because PyPI's torchvision builds
do not import beside this project's CPU torch. Copied from torchvision 0.28
(torchvision/datasets/folder.py: IMG_EXTENSIONS, find_classes, make_dataset), only
reduced to what ImageFolder calls with its defaults."""

from __future__ import annotations

import os

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(directory: str) -> tuple[list[str], dict[str, int]]:
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    return classes, class_to_idx


def make_dataset(directory: str, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    directory = os.path.expanduser(directory)
    instances = []
    available_classes = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_index))
                    if target_class not in available_classes:
                        available_classes.add(target_class)
    empty_classes = set(class_to_idx.keys()) - available_classes
    if empty_classes:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty_classes))}. "
        msg += f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
        raise FileNotFoundError(msg)
    return instances


def image_folder(root: str) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
    """(classes, class_to_idx, samples) as ImageFolder(root) sets them."""
    classes, class_to_idx = find_classes(root)
    return classes, class_to_idx, make_dataset(root, class_to_idx)
