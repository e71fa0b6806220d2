from pathlib import Path


def test_largest_files():
    lines = Path("/app/largest.txt").read_text().strip().splitlines()
    assert lines == [
        "2000000 /data/cache/blob.dat",
        "1048576 /data/media/video.bin",
        "524288 /data/logs/old/app.log.1",
    ]


def test_links_are_not_counted():
    assert "blob-link" not in Path("/app/largest.txt").read_text()
