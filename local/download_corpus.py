"""Downloads a corpus with Lhotse's download functions into a recipe's ``download/``.

Skips a corpus whose folder exists (a real copy placed or symlinked there counts).
When downloading fails, the message says how to place an existing copy instead.

    python -m local.download_corpus librispeech download --parts train-clean-100 dev-clean
    python -m local.download_corpus gigaspeech download --parts XL DEV TEST \\
        --password-file download/password --host magicdata
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

# Folder that each download creates inside the download directory.
CORPUS_FOLDERS = {"librispeech": "LibriSpeech", "aishell": "aishell", "gigaspeech": "GigaSpeech", "musan": "musan"}
GIGASPEECH_HOSTS = ("tsinghua", "speechocean", "magicdata")


class DownloadError(RuntimeError):
    pass


def corpus_folder(corpus: str, download_dir: Path) -> Path:
    return Path(download_dir) / CORPUS_FOLDERS[corpus]


def _gigaspeech_password(password_file: Path) -> str:
    if not password_file.is_file():
        raise DownloadError(
            f"GigaSpeech needs the password its authors send on request; write it into {password_file} "
            "(one line) or pass --password-file"
        )
    return password_file.read_text().strip()


def _remove_if_empty(folder: Path) -> None:
    """A failed download must not leave an empty corpus folder that a rerun takes for done."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def download_corpus(
    corpus: str,
    download_dir: Path,
    parts: Sequence[str] = (),
    password_file: Path = None,
    host: str = "tsinghua",
) -> Path:
    """Returns the corpus folder, downloading it first when it does not exist."""
    from lhotse.recipes import download_aishell, download_librispeech, download_musan

    download_dir = Path(download_dir)
    target = corpus_folder(corpus, download_dir)
    if target.is_dir() and any(target.iterdir()):
        logging.info(f"{target} exists: not downloading {corpus}")
        return target
    download_dir.mkdir(parents=True, exist_ok=True)
    logging.info(f"downloading {corpus} into {download_dir} (this takes long for full corpora)")
    try:
        if corpus == "librispeech":
            download_librispeech(download_dir, dataset_parts=list(parts) or "librispeech")
        elif corpus == "aishell":
            download_aishell(download_dir)
        elif corpus == "musan":
            download_musan(download_dir)
        elif corpus == "gigaspeech":
            from lhotse.recipes.gigaspeech import download_gigaspeech

            if host not in GIGASPEECH_HOSTS:
                raise DownloadError(f"--host must be one of {GIGASPEECH_HOSTS}, found {host!r}")
            password = _gigaspeech_password(Path(password_file or download_dir / "password"))
            target.mkdir(parents=True, exist_ok=True)
            download_gigaspeech(password, target, dataset_parts=list(parts) or "auto", host=host)
        else:
            raise DownloadError(f"unknown corpus {corpus!r}; expected one of {sorted(CORPUS_FOLDERS)}")
    except DownloadError:
        _remove_if_empty(target)
        raise
    except Exception as error:
        _remove_if_empty(target)
        raise DownloadError(
            f"downloading {corpus} into {download_dir} failed ({type(error).__name__}: {error}).\n"
            f"If you already have a copy, place or symlink it at {target}, e.g.\n"
            f"  ln -s /path/to/your/{CORPUS_FOLDERS[corpus]} {target}"
        ) from None
    return target


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", choices=sorted(CORPUS_FOLDERS))
    parser.add_argument("download_dir", type=Path)
    parser.add_argument("--parts", nargs="*", default=[], help="LibriSpeech parts or GigaSpeech subsets")
    parser.add_argument("--password-file", type=Path, help="GigaSpeech: default <download_dir>/password")
    parser.add_argument("--host", default="tsinghua", help=f"GigaSpeech mirror: {', '.join(GIGASPEECH_HOSTS)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        download_corpus(args.corpus, args.download_dir, args.parts, args.password_file, args.host)
    except DownloadError as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
