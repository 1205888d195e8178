// SPDX-License-Identifier: BSD-3-Clause
/*
 * Value lifetimes for the dht rendezvous (rdv_dht_life.h says why).
 *
 * The C API of OpenDHT 2.4 can neither register a value type nor set one on
 * a value, so this one file uses the C++ API on the C API's handles. It
 * relies on how libopendht-c represents them (c/opendht.cpp in 2.4.12): a
 * dht_runner is a dht::DhtRunner and a dht_value a
 * std::shared_ptr<dht::Value>, each cast back and forth, never wrapped.
 * test_rdv_dht's lifetime case puts a value through these handles and
 * reads it from another node before and after its lifetime, so a library
 * that represents them otherwise fails there rather than in a run.
 */
#include <cerrno>
#include <chrono>
#include <memory>
#include <new>
#include <string>

#include <opendht/dhtrunner.h>
#include <opendht/value.h>

#include "rdv_dht_life.h"

namespace {

constexpr uint64_t first_life_ms = 80000;
constexpr uint64_t default_life_ms = 600000; // dht::ValueType::USER_DATA

dht::DhtRunner &runner_of(dht_runner *r)
{
	return *reinterpret_cast<dht::DhtRunner *>(r);
}

} // namespace

extern "C" int mp_dht_life_register_type(dht_runner *r, uint16_t type, uint64_t ms)
{
	try {
		std::string name = "moshpit-" + std::to_string(ms) + "ms";

		runner_of(r).registerType(dht::ValueType(type, name, std::chrono::milliseconds(ms)));
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	}
	return 0;
}

extern "C" int mp_dht_life_register(dht_runner *r)
{
	for (unsigned k = 0; k < MP_DHT_LIFE_N; k++) {
		int rc = mp_dht_life_register_type(r, static_cast<uint16_t>(MP_DHT_LIFE_BASE + k),
						   first_life_ms << k);
		if (rc)
			return rc;
	}
	return 0;
}

extern "C" uint16_t mp_dht_life_type(uint64_t ms)
{
	for (unsigned k = 0; k < MP_DHT_LIFE_N; k++)
		if (ms <= first_life_ms << k)
			return static_cast<uint16_t>(MP_DHT_LIFE_BASE + k);
	return 0;
}

extern "C" uint64_t mp_dht_life_ms(uint16_t type)
{
	if (type == 0)
		return default_life_ms;
	if (type < MP_DHT_LIFE_BASE || type >= MP_DHT_LIFE_BASE + MP_DHT_LIFE_N)
		return 0;
	return first_life_ms << (type - MP_DHT_LIFE_BASE);
}

extern "C" void mp_dht_value_set_type(dht_value *v, uint16_t type)
{
	(*reinterpret_cast<std::shared_ptr<dht::Value> *>(v))->type = type;
}

extern "C" uint16_t mp_dht_value_type(const dht_value *v)
{
	return (*reinterpret_cast<const std::shared_ptr<dht::Value> *>(v))->type;
}
