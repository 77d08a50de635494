"""Builds the chemical components dictionary subset that the ``alphafold3-colabfold`` wheel lacks
(it ships no ``ccd.pickle``: ``import alphafold3.model.model`` fails without one, and its own
fetcher downloads from the RCSB), from the whole dictionary biotite's wheel bundles
(``biotite/structure/info/components.bcif``), parsed with AlphaFold 3's own mmCIF parser and
written with AlphaFold 3's own writers, so that its loader reads them as it reads its own.

The standard residues (20 amino acids, UNK, the nucleotides, water): enough for protein-only
inputs. Usage: ``python af3_dictionary.py [OUT_DIR]``, run with the Python that has
``alphafold3`` and ``biotite``; without OUT_DIR the files go into the installed package's
``constants/converters/`` (where AlphaFold 3 reads them). Offline.
"""

import io
import os
import pickle
import sys

#: The components written: AlphaFold 3's standard polymer residues, the unknowns, and water.
CODES = ("ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL UNK "
         "MSE A G C U DA DG DC DT N DN HOH UNL UNX").split()


def cif_text(codes) -> bytes:
    """The components ``codes`` of biotite's bundled dictionary, as mmCIF text."""
    from biotite.structure import info
    from biotite.structure.io import pdbx

    out = pdbx.CIFFile()
    for code in codes:
        block = pdbx.CIFBlock()
        for name in ("chem_comp", "chem_comp_atom", "chem_comp_bond"):
            found = info.get_from_ccd(name, code)
            if found is not None:
                block[name] = pdbx.CIFCategory({col: found[col].as_array(str) for col in found})
        out[code] = block
    text = io.StringIO()
    out.write(text)
    return text.getvalue().encode()


def main(argv) -> int:
    import alphafold3
    from alphafold3.constants import chemical_components
    from alphafold3.constants.converters import chemical_component_sets_gen
    from alphafold3.cpp import cif_dict

    folder = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(alphafold3.__file__),
                                                        "constants", "converters")
    os.makedirs(folder, exist_ok=True)
    whole = cif_text(CODES)
    ccd = {key: value.to_dict() for key, value in cif_dict.parse_multi_data_cif(whole).items()}
    missing = sorted(set(CODES) - set(ccd))
    if missing:
        sys.exit(f"af3_dictionary: biotite's dictionary lacks {missing}")
    path = os.path.join(folder, "ccd.pickle")
    chemical_components.write_atomic(path, lambda f: pickle.dump(ccd, f, protocol=pickle.HIGHEST_PROTOCOL))
    chemical_components.write_ccd_index(ccd, path)
    sets = chemical_component_sets_gen.find_ions_and_glycans_in_ccd(ccd)
    with open(os.path.join(folder, "chemical_component_sets.pickle"), "wb") as out:
        pickle.dump(sets, out)
    print(f"af3_dictionary: {len(ccd)} components into {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
