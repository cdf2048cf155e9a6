"""What a pack is made from: listing inputs, and what each file is (media, images, video)."""
