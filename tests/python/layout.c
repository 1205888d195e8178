/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Prints the layout of the public structs that python/moshpit/_lib.py
 * mirrors, as "struct field offset size" lines and "struct - sizeof -"
 * lines, so that tests/python/test_layout.py can compare the two: a field
 * added to moshpit.h without its mirror fails there.
 *
 * The field list is the mirror's own; a field of the header missing from
 * it is caught by the sizeof line (fields are only appended).
 */
#include <stddef.h>
#include <stdio.h>

#include <moshpit/moshpit.h>

#define F(s, f) printf(#s " " #f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s *)0)->f))
#define S(s) printf(#s " - %zu -\n", sizeof(struct s))

/* A constant _lib mirrors under the name without its MP_ prefix. */
#define C(name) printf("const " #name " %u -\n", (unsigned)(name))

int main(void)
{
	C(MP_AVG_UNCOMPRESSED);
	C(MP_AVG_FLUSH);
	C(MP_MEM_CUDA);
	C(MP_MEM_PATH_HOST);
	C(MP_MEM_PATH_STAGED);
	C(MP_MEM_PATH_DEVICE);
	C(MP_MEM_PATH_GPUDIRECT);
	F(mp_config, size);
	F(mp_config, rank);
	F(mp_config, npeers);
	F(mp_config, peers);
	F(mp_config, hostfile);
	F(mp_config, listen);
	F(mp_config, run_name);
	F(mp_config, transport);
	F(mp_config, grid);
	F(mp_config, bandwidths);
	F(mp_config, algo);
	F(mp_config, rounds);
	F(mp_config, codec);
	F(mp_config, chunk_bytes);
	F(mp_config, streams);
	F(mp_config, window);
	F(mp_config, connect_timeout_ms);
	F(mp_config, round_timeout_ms);
	F(mp_config, checksum_payload);
	F(mp_config, spin_us);
	F(mp_config, log_level);
	F(mp_config, codec_block);
	F(mp_config, codec_sigmas);
	F(mp_config, topk_ratio);
	F(mp_config, adacomp_bin);
	F(mp_config, rendezvous);
	F(mp_config, bootstrap);
	F(mp_config, dht_port);
	F(mp_config, mode);
	F(mp_config, bandwidth);
	F(mp_config, run_key);
	F(mp_config, run_key_file);
	F(mp_config, peer_id);
	F(mp_config, group_size);
	F(mp_config, min_group_size);
	F(mp_config, matchmaking_ms);
	F(mp_config, request_timeout_ms);
	F(mp_config, allreduce_timeout_ms);
	F(mp_config, record_ttl_ms);
	F(mp_config, join_timeout_ms);
	F(mp_config, min_part);
	F(mp_config, contrib_log);
	F(mp_config, fault);
	F(mp_config, balance);
	F(mp_config, check_finite);
	F(mp_config, probe_min_ms);
	F(mp_config, probe_max_ms);
	F(mp_config, direct_max);
	F(mp_config, max_handshakes);
	F(mp_config, cuda_stage);
	F(mp_config, state_rate);
	F(mp_config, direct_pairs);
	S(mp_config);
	F(mp_result, rounds);
	F(mp_result, peers);
	F(mp_result, weight);
	F(mp_result, bytes_sent);
	F(mp_result, bytes_received);
	F(mp_result, frames_rejected);
	F(mp_result, failed_peers);
	F(mp_result, codec);
	F(mp_result, values_sent);
	F(mp_result, rounds_alone);
	F(mp_result, group_size);
	S(mp_result);
	F(mp_peer_info, id);
	F(mp_peer_info, rank);
	F(mp_peer_info, mode);
	F(mp_peer_info, state);
	F(mp_peer_info, failures);
	F(mp_peer_info, addr);
	F(mp_peer_info, since_progress_s);
	F(mp_peer_info, bandwidth_Bps);
	F(mp_peer_info, rtt_s);
	F(mp_peer_info, bytes_sent);
	F(mp_peer_info, bytes_received);
	F(mp_peer_info, rate_Bps);
	F(mp_peer_info, weight);
	S(mp_peer_info);
	F(mp_stats, frames_rejected);
	F(mp_stats, conns_accepted);
	F(mp_stats, conns_authenticated);
	F(mp_stats, conns_refused);
	F(mp_stats, conns_timed_out);
	F(mp_stats, conns_evicted);
	F(mp_stats, conns_hung_up);
	F(mp_stats, handshakes_pending);
	F(mp_stats, handshakes_max);
	F(mp_stats, peers_known);
	F(mp_stats, peers_held);
	F(mp_stats, state_served);
	F(mp_stats, state_refused);
	F(mp_stats, state_cut);
	F(mp_stats, state_busy);
	S(mp_stats);
	F(mp_state_info, version);
	F(mp_state_info, bytes);
	F(mp_state_info, nbufs);
	F(mp_state_info, meta_len);
	F(mp_state_info, source);
	F(mp_state_info, tries);
	F(mp_state_info, resumed);
	S(mp_state_info);
	return 0;
}
