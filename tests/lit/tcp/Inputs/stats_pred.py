"""stats_pred.py TENSOR.json BYTES.json: two `moec run --stats` files of one
program, simulated by tensor and by bytes. Prints, for each, whether its
predicted_seconds equals its simulated_seconds, then how many cycles longer
the byte-ordered simulation ran."""
import json
import sys


def main():
    runs = [json.load(open(p)) for p in sys.argv[1:3]]
    for name, d in zip(("tensor", "bytes"), runs):
        same = d["predicted_seconds"] == d["simulated_seconds"]
        print("%s: predicted %s simulated (%r, %r)" % (name, "==" if same else "!=", d["predicted_seconds"],
                                                        d["simulated_seconds"]))
    print("bytes - tensor: %d cycles" % (runs[1]["cycles"] - runs[0]["cycles"]))


if __name__ == "__main__":
    main()
