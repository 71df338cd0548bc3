"""PPO as CleanRL's ppo.py writes it, shortened, on a made-up environment:
each iteration collects a rollout of `--num-steps` environment steps with
the agent under torch.no_grad() (and in training mode: CleanRL never calls
agent.eval()), then runs `--update-epochs` epochs of minibatch updates.

    python ppo_rollouts.py [--iterations N]

Prints `UPDATES <n>` and `ROLLOUT_MS <the rollouts' time in all, by the
script's own stopwatch>`.
"""

from __future__ import annotations

import argparse
from time import perf_counter

import torch
from torch import nn
from torch.distributions.categorical import Categorical


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, n_actions))

    def forward(self, x: torch.Tensor, action: torch.Tensor | None = None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n_obs, n_actions, n = 8, 4, args.num_steps
    agent = Agent(n_obs, n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    obs, actions = torch.zeros(n, n_obs), torch.zeros(n, dtype=torch.long)
    logprobs, rewards, values = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    next_obs = torch.randn(n_obs)
    updates, rollout = 0, 0.0
    for _ in range(args.iterations):
        began = perf_counter()
        for step in range(n):
            obs[step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value
            next_obs = torch.randn(n_obs)  # the environment's step
            rewards[step] = float(action == 1)
        rollout += perf_counter() - began
        returns = rewards.flip(0).cumsum(0).flip(0)
        advantages = returns - values
        size = n // args.minibatches
        for _ in range(args.update_epochs):
            order = torch.randperm(n)
            for start in range(0, n, size):
                mb = order[start:start + size]
                _, newlogprob, entropy, newvalue = agent(obs[mb], actions[mb])
                ratio = (newlogprob - logprobs[mb]).exp()
                adv = advantages[mb]
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
                v_loss = 0.5 * ((newvalue - returns[mb]) ** 2).mean()
                loss = pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
                updates += 1
    print(f"UPDATES {updates}", flush=True)
    print(f"ROLLOUT_MS {rollout * 1e3:.3f}", flush=True)


if __name__ == "__main__":
    main()
