// `sweep merge OUT.h5 SHARD.h5... [--force] [--quiet]`: combines the files of
// `sweep CONFIG --shard K/N` into the file a single-machine run of CONFIG writes.
//
// Checks, each refused as bad input (InputError, exit 2) with what to do: every file is a
// shard file of one config (config_sha256) and one build (roundoff_version, git_commit),
// the same split (shard_count), every shard given once, each marks done only runs its
// shard holds, and together they hold every run, finished (a missing or unfinished shard
// is listed with the exact command that computes or finishes it).
//
// What merge assumes of the layout (results/README.md, "Shards and merging"): it copies
// the groups, datasets and attributes it finds in the first shard, driven by the file
// alone, so that datasets added later are merged without changes here:
// - a dataset whose first dimension is n_points holds one row per point; row p is read
//   from the shard holding point p; a point split between shards (at most N - 1) is
//   combined element by element from its shards: each element is the one that differs
//   from the dataset's fill value (shards that leave what they do not hold at the fill
//   value agree by construction; two different written values are refused). Further
//   dimensions may differ between shards (growing traces): the largest is kept, padded
//   with the fill value;
// - a one-dimensional compound dataset with an integer member `point` is a table of rows
//   per run (member `replica`, or replica 0 without one): each shard contributes its own
//   runs' rows, ordered by (point, replica) and, within a run, as that shard wrote them;
// - any other dataset must be the same in every shard and is copied;
// - /done is set to 1 everywhere; the root attributes are those of the shards (equal in
//   all but `created`, which takes the earliest, and `status`, set to complete) without
//   the shard's own shard_index, shard_count and config_path; other attributes must be
//   equal in every shard.
#pragma once

namespace roundoff::sweep {

// argv[0] is "merge". Throws InputError for bad input.
int merge_main(int argc, char** argv);

}  // namespace roundoff::sweep
