"""Small data files shipped with the package (ImageNet-C reference errors, ImageNet WordNet ids, ImageNet-D vocabularies)."""
